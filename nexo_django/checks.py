"""System checks: stable ids, and a hint that names the fix."""

from __future__ import annotations
