"""core.tools.shell_settings: the policy built from NEXO["SHELL"] is kept for the same setting,
and never for a setting that changed (in place too) or that only compares equal."""

from __future__ import annotations

import pytest

from nexo_django.core.errors import ConfigurationError
from nexo_django.core.tools.base import Limits
from nexo_django.core.tools.shell_settings import shell_policy


def test_the_same_setting_gets_the_policy_built_before() -> None:
    limits = Limits.from_mapping({})
    setting = {"NETWORK": ["example.org"], "READ": ["/opt"]}
    first = shell_policy(setting, limits)
    assert shell_policy(dict(setting), limits) is first
    assert first.network == ("example.org",) and first.read == ("/opt",)


def test_a_setting_changed_in_place_gets_a_new_policy() -> None:
    limits = Limits.from_mapping({})
    setting = {"NETWORK": ["example.org"]}
    assert shell_policy(setting, limits).network == ("example.org",)
    setting["NETWORK"].append("example.com")
    assert shell_policy(setting, limits).network == ("example.org", "example.com")
    setting["CONFINE"] = False
    assert shell_policy(setting, limits).confine is False


def test_a_value_equal_to_a_valid_one_is_still_refused() -> None:
    limits = Limits.from_mapping({})
    assert shell_policy({"CONFINE": True}, limits).confine is True
    with pytest.raises(ConfigurationError, match="True or False"):
        shell_policy({"CONFINE": 1}, limits)  # 1 == True, but it is not a bool


def test_other_limits_give_their_own_caps() -> None:
    setting = {"CONFINE": True}
    small = Limits.from_mapping({"shell_memory": 1024**2})
    assert shell_policy(setting, small).memory == 1024**2
    assert shell_policy(setting, Limits.from_mapping({})).memory == Limits().shell_memory


def test_limits_of_the_same_mapping_are_one_object_and_unknown_keys_always_fail() -> None:
    assert Limits.from_mapping({"read_max_bytes": 10}) is Limits.from_mapping({"read_max_bytes": 10})
    assert Limits.from_mapping({"read_max_bytes": 10}).read_max_bytes == 10
    assert Limits.from_mapping({"read_max_bytes": 11}).read_max_bytes == 11
    assert Limits.from_mapping({"shell_ports": [8080]}).shell_ports == (8080,)
    for _ in range(2):
        with pytest.raises(ValueError, match="unknown limit"):
            Limits.from_mapping({"nope": 1})
