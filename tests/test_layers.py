"""The layers the folders show, held against every import in the code
(function-local ones too): each package imports only the layers below it,
and no two modules import each other, directly or round a circle.

    experiments ──> tasks ──> tff_algos.{training.task, core.hparams, errors}
        │
        └──> tff_algos.flags ──> tff_algos.algorithms ──> tff_algos.core
             tff_algos.training ──> tff_algos.runtime, tff_algos.core
"""

import ast
import collections
import os

from paths import ROOT

PACKAGES = ('tff_algos', 'tasks', 'experiments')
# Layer -> the layers it may import (besides itself). A layer is the first
# match, longest first, of a module's dotted name.
ALLOWED = {
    'tff_algos.errors': set(),
    'tff_algos.lazy': set(),
    'tff_algos.core': {'tff_algos.errors', 'tff_algos.lazy'},
    'tff_algos.runtime': {'tff_algos.errors', 'tff_algos.lazy'},
    'tff_algos.algorithms': {'tff_algos.core', 'tff_algos.errors', 'tff_algos.lazy'},
    'tff_algos.training': {'tff_algos.core', 'tff_algos.runtime', 'tff_algos.errors',
                           'tff_algos.lazy'},
    'tff_algos.flags': {'tff_algos.algorithms', 'tff_algos.core', 'tff_algos.errors',
                        'tff_algos.lazy'},
    'tff_algos': {'tff_algos.lazy'},   # the package's own __init__
    'tasks': {'tff_algos.core', 'tff_algos.training', 'tff_algos.errors'},
    'experiments': {'tasks', 'tff_algos.core', 'tff_algos.runtime', 'tff_algos.algorithms',
                    'tff_algos.training', 'tff_algos.flags', 'tff_algos.errors',
                    'tff_algos.lazy'},
}


def _modules() -> dict[str, str]:
  found = {}
  for top in PACKAGES:
    for directory, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(directory, name)
          module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
          found[module.removesuffix('.__init__')] = path
  return found


def _imports(modules: dict[str, str]) -> dict[str, set[str]]:
  """Module -> the project's modules it imports anywhere in its code."""
  def resolve(name):
    while name and name not in modules:
      name = name.rpartition('.')[0]
    return name

  edges = collections.defaultdict(set)
  for module, path in modules.items():
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        # `from a import b`: module a.b where there is one, else a (b: a name in it).
        names = [f'{node.module}.{a.name}' for a in node.names]
      else:
        continue
      for name in names:
        target = resolve(name)
        # A package's own __init__ (`from tff_algos import lazy` in tff_algos.x) is no edge.
        if target and target != module and not module.startswith(target + '.'):
          edges[module].add(target)
  return edges


def _layer(module: str) -> str:
  return max((layer for layer in ALLOWED if module == layer or module.startswith(layer + '.')),
             key=len)


def test_every_import_goes_down_the_layers():
  modules = _modules()
  upward = sorted(f'{m} -> {t}' for m, targets in _imports(modules).items() for t in targets
                  if _layer(t) != _layer(m) and _layer(t) not in ALLOWED[_layer(m)])
  assert upward == []


def test_no_module_under_tff_algos_imports_tasks_or_experiments():
  modules = _modules()
  bad = sorted(f'{m} -> {t}' for m, targets in _imports(modules).items() if m.startswith(
      'tff_algos') for t in targets if t.split('.')[0] in ('tasks', 'experiments'))
  assert bad == []


def test_no_import_circle():
  edges = _imports(_modules())
  index, low, stack, on_stack, circles = {}, {}, [], set(), []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for module in sorted(_modules()):
    if module not in index:
      visit(module)
  assert circles == []


def test_at_most_three_modules_at_the_top_of_the_library():
  top = [f for f in os.listdir(os.path.join(ROOT, 'tff_algos')) if f.endswith('.py')]
  assert len(top) <= 3, top
  assert 'tasks' not in str(ALLOWED['tff_algos.core'])   # the table above is the layout


def test_the_layer_table_names_every_package_of_the_library():
  packages = {f'tff_algos.{d}' for d in os.listdir(os.path.join(ROOT, 'tff_algos'))
              if os.path.isfile(os.path.join(ROOT, 'tff_algos', d, '__init__.py'))}
  assert packages <= set(ALLOWED), packages - set(ALLOWED)
