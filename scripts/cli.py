"""The scripts' command lines: --help and one-line argument errors (scripts/cli.sh is the shell scripts' own).

A script parses its arguments before it imports a package that is heavy or may be missing (torch, numpy,
...), so that --help and a bad argument are answered on any machine, at once:

    if __name__ == "__main__":
        ARGS = parse_args()  # (cli.ArgumentParser) before the imports below
    try:
        import torch
    except ModuleNotFoundError as e:
        cli.missing_package(__file__, e, "requirements-gpu.txt")
    ...
    if __name__ == "__main__":
        main(ARGS)

Standard library only.
"""
import argparse
import os
import re
import sys


def argument_error(script, message):
    """An argument error: one line "scripts/NAME: MESSAGE" on stderr, exit 2 (also ArgumentParser's errors, and a
    check that needs the script's packages, after its arguments were parsed)."""
    print(f"scripts/{os.path.basename(script)}: {message}", file=sys.stderr)
    sys.exit(2)


def missing_package(script, error, requirements="requirements.txt"):
    """One line naming the package a script lacks and how to install it (exit 1)."""
    sys.exit(f"error: {os.path.basename(script)} needs the Python package {error.name}: "
             f"python3 -m pip install -r {requirements}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser for the script file `script`: prog "scripts/NAME", the description and epilog
    printed as written, no abbreviated options, and every error one line on stderr, exit 2: an unknown
    argument (named before any other error) is "scripts/NAME: unknown argument 'X' (--help lists them)"."""

    def __init__(self, script, **kwargs):
        self.script = script
        super().__init__(prog=f"scripts/{os.path.basename(script)}", allow_abbrev=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        for a in args:
            if a == "--":
                break
            # an option string that no argument of this parser takes (a negative number is a value)
            if a.startswith("-") and not re.fullmatch(r"-\.?\d.*|-|[^ ]* .*", a) and \
                    a.split("=", 1)[0] not in self._option_string_actions:
                self.error(f"unknown argument '{a}' (--help lists them)")
        known, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(f"unknown argument '{extra[0]}' (--help lists them)")
        return known

    def error(self, message):
        argument_error(self.script, message)
