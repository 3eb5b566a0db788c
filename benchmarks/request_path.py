"""The path of ``llmattr explain``'s request through the code (issue 49): from the command's body to the
explanation it prints, how many llmattr modules the calls enter, how often a call enters a module the path had
already entered and left (a return), and how many times each text is prepared (``Task.example_from_text``, the
prompt rendered: ``prompting.build_prompt``).

Only llmattr -> llmattr calls are counted (a call whose caller is llmattr code), so the model's own code calling
back into the attention probe is not, nor a read of a library bound by ``llmattr.lazy`` (``torch.zeros``). Run it
on two revisions' ``src`` with the same arguments to compare them:

    PYTHONPATH=src python benchmarks/request_path.py
    PYTHONPATH=/path/to/old/src python benchmarks/request_path.py
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

PREPARED = ("example_from_text", "build_prompt")  # a text turned into an example, a prompt rendered


def trace(argv: list[str]) -> tuple[list[str], Counter]:
    """The modules entered by llmattr -> llmattr calls while ``llmattr ARGV`` runs, in order (a module entered from
    itself is not a new entry), and the calls of :data:`PREPARED`."""
    from llmattr.cli import main

    entered: list[str] = []
    prepared: Counter = Counter()

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if callee.startswith("llmattr") and caller.startswith("llmattr") and callee != "llmattr.lazy":
            if callee != caller and (not entered or entered[-1] != callee):
                entered.append(callee)
            if frame.f_code.co_name in PREPARED:
                prepared[frame.f_code.co_name] += 1

    sys.argv = ["llmattr", *argv]
    sys.setprofile(profile)
    try:
        main()
    except SystemExit as done:
        if done.code:
            raise
    finally:
        sys.setprofile(None)
    return entered, prepared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--method", default="saliency")
    parser.add_argument("--text", default="A gripping, well acted film.")
    args = parser.parse_args()
    import llmattr

    entered, prepared = trace(["explain", args.text, "--model", args.model, "--method", args.method,
                               "--format", "json"])
    returns = sum(module in entered[:i] for i, module in enumerate(entered))
    print(f"\n| llmattr | modules entered | entries | returns to a module already left | "
          f"example_from_text | build_prompt |\n| --- | ---: | ---: | ---: | ---: | ---: |\n"
          f"| {Path(llmattr.__file__).parents[1]} | {len(set(entered))} | {len(entered)} | {returns} | "
          f"{prepared['example_from_text']} | {prepared['build_prompt']} |")


if __name__ == "__main__":
    main()
