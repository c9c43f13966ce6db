"""`python -m experiments`: the binaries of this package, a line each.

Each is run as `python -m experiments.<name>` (`--help` lists its flags); the
README's "Two commands" and docs/reproducing.md start there.
"""

import ast
import os
import sys


def binaries() -> list[tuple[str, str]]:
  """(name, first line of its docstring) of every module here that runs as a program."""
  here = os.path.dirname(os.path.abspath(__file__))
  found = []
  for file in sorted(os.listdir(here)):
    if not file.endswith('.py') or file.startswith('_'):
      continue
    with open(os.path.join(here, file)) as f:
      source = f.read()
    if "if __name__ == '__main__':" not in source:
      continue
    doc = ast.get_docstring(ast.parse(source)) or ''
    found.append((file[:-3], doc.splitlines()[0] if doc else ''))
  return found


def main() -> int:
  print('python -m experiments.<name> [--help], where <name> is one of:')
  listed = binaries()
  width = max(len(name) for name, _ in listed)
  for name, line in listed:
    print(f'  {name:{width}s}  {line}')
  print('Start with: python -m experiments.train (README, "Quickstart").')
  return 0


sys.exit(main())
