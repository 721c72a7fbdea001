"""Fix a typo in README.md with an agent that asks before it writes. In process: no database.

    python example_project/edit_readme.py            # README.md of the current folder
    python example_project/edit_readme.py --demo     # a fresh temp folder with a typo in it
    python example_project/edit_readme.py --yes      # answer yes without a terminal

The model is SCRIPTED (``nexo_django.testing.ScriptedModel``): no model service is called. Its
script reads README.md, then writes back the text with known typos fixed. For a real model, put
``model = "openai:gpt-4.1-mini"`` (and set OPENAI_API_KEY) in the class below.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from nexo_django import Agent, Permissions
from nexo_django.testing import ScriptedModel, reply, tool_call

TYPOS = {"teh": "the", "recieve": "receive", "seperate": "separate", "wierd": "weird"}
DEMO_README = "# Demo\n\nThis is teh demo project. You will recieve a fixed copy.\n"


def fix_typos(text: str) -> str:
    for wrong, right in TYPOS.items():
        text = re.sub(rf"\b{wrong}\b", right, text)
    return text


def scripted_editor(readme: str) -> ScriptedModel:
    """The script a real model would improvise: read the file, write the fix, say what it did.

    A scripted model cannot read, so the fix is worked out here, before the run.
    """
    fixed = fix_typos(readme)
    if fixed == readme:
        return ScriptedModel([tool_call("read", path="README.md"), reply("README.md has no typo I know of.")])
    return ScriptedModel(
        [
            tool_call("read", path="README.md"),
            tool_call("write", path="README.md", content=fixed),
            reply("I proposed a fixed README.md."),
        ]
    )


def terminal_gate(assume_yes: bool) -> Permissions:
    """``ask`` mode: reads pass (the default ``allow``); every write asks on the terminal."""

    def on_ask(capability: str, detail: Any) -> bool:
        question = f"The agent wants to {capability} {detail!r}. Allow? [y/N] "
        if assume_yes:
            print(question + "y (--yes)")
            return True
        try:
            answer = input(question)
        except EOFError:  # no terminal and no --yes: the safe answer
            print("(no answer: no)")
            return False
        if not sys.stdin.isatty():
            print(answer)  # piped answers are not echoed
        return answer.strip().lower() in ("y", "yes")

    return Permissions("ask", on_ask=on_ask)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--yes", action="store_true", help="answer yes to every question")
    parser.add_argument("--demo", action="store_true", help="work on a README with a typo in a temp folder")
    options = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="nexo-edit-readme-")) if options.demo else Path.cwd()
    if options.demo:
        (folder / "README.md").write_text(DEMO_README, encoding="utf-8")
        os.chdir(folder)
    readme = folder / "README.md"
    if not readme.is_file():
        print(f"no README.md in {folder}; run with --demo to try it on a temp copy", file=sys.stderr)
        return 2
    gate = terminal_gate(options.yes)

    # The five lines of the example: an agent on a workspace folder, gated by a person.
    class Editor(Agent):
        model = scripted_editor(readme.read_text(encoding="utf-8"))
        sandbox = "local"

    print(f"Model: {Editor.model}: no model service is called.")
    print(f"Workspace: {folder}")
    result = Editor(cwd=".", permissions=gate).prompt("Fix the typo in README.md")

    for call in result.tool_calls:
        outcome = call.result.get("error") if call.result and "error" in call.result else "ok"
        print(f"  {call.name}({call.args.get('path')!r}): {outcome}")
    print(f"Agent: {result.content}")
    print("--- README.md now ---")
    print(readme.read_text(encoding="utf-8"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
