"""The import graph against the layers docs/ARCHITECTURE.md declares: no cycle, no upward arrow.

Imports are read from the source (ast), function-level ones included, so nothing is imported
here; the layer table is parsed from the `layers` block of docs/ARCHITECTURE.md.
"""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = ('tff_dp', 'tasks')
_SCRIPTS = ('run_experiment.py', 'reproduce.py')


def declared_layers(markdown: str) -> list[tuple[str, list[str]]]:
  """[(layer name, [module prefixes])], top layer first, from the ```layers block."""
  block = re.search(r'```layers\n(.*?)```', markdown, re.S)
  if block is None:
    raise ValueError('no ```layers block')
  layers = []
  for line in block.group(1).strip().splitlines():
    name, _, prefixes = line.partition(':')
    layers.append((name.strip(), prefixes.split()))
  return layers


def module_files(root: str) -> dict[str, str]:
  """Dotted module name -> file, for the packages and the top-level scripts."""
  files = {script[:-3]: os.path.join(root, script) for script in _SCRIPTS}
  for package in _PACKAGES:
    for dirpath, _, names in os.walk(os.path.join(root, package)):
      for name in names:
        if name.endswith('.py'):
          dotted = os.path.relpath(os.path.join(dirpath, name), root)[:-3].replace(os.sep, '.')
          files[dotted.removesuffix('.__init__')] = os.path.join(dirpath, name)
  return files


def imported_modules(source: str, module: str, is_package: bool, known: set) -> set[str]:
  """Our modules that `source` (of `module`) imports, at any depth of the syntax tree."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:   # Relative import: resolve against this module's package.
        parts = module.split('.') if is_package else module.split('.')[:-1]
        parts = parts[:len(parts) - node.level + 1]
        base = '.'.join(parts + ([base] if base else []))
      names = [f'{base}.{a.name}' if f'{base}.{a.name}' in known else base for a in node.names]
    else:
      continue
    found.update(n for n in names if n in known or n.split('.')[0] in _PACKAGES)
  return found


def import_graph(root: str) -> dict[str, set[str]]:
  files = module_files(root)
  known = set(files)
  graph = {}
  for module, path in files.items():
    with open(path, encoding='utf-8') as f:
      graph[module] = imported_modules(f.read(), module, path.endswith('__init__.py'), known)
  return graph


def layer_of(module: str, layers) -> int:
  """Index of the layer (0 = top) whose longest prefix matches `module`; -1 if none does."""
  best, best_len = -1, -1
  for index, (_, prefixes) in enumerate(layers):
    for prefix in prefixes:
      if (module == prefix or module.startswith(prefix + '.')) and len(prefix) > best_len:
        best, best_len = index, len(prefix)
  return best


def violations(graph: dict[str, set[str]], layers) -> list[str]:
  """Modules in no layer, arrows that point up the layer table, and import cycles."""
  problems = [f'{m} is in no declared layer' for m in sorted(graph) if layer_of(m, layers) < 0]
  for src in sorted(graph):
    for dst in sorted(graph[src]):
      s, d = layer_of(src, layers), layer_of(dst, layers)
      if s >= 0 and d >= 0 and d < s:
        problems.append(f'upward import: {src} ({layers[s][0]}) -> {dst} ({layers[d][0]})')
  problems += [f'import cycle: {" -> ".join(c)}' for c in cycles(graph)]
  return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (as a closed path) per strongly connected component with more than one module
  or a self-import (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  counter = 0
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph.get(start, ()))))]
    index[start] = low[start] = counter
    counter += 1
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in graph:
          continue
        if child not in index:
          index[child] = low[child] = counter
          counter += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph.get(child, ())))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1 or node in graph.get(node, ()):
          found.append(_closed_path(sorted(component), graph))
  return found


def _closed_path(component: list[str], graph) -> list[str]:
  """A cycle through the component's first module, for the error message."""
  members, start = set(component), component[0]
  paths = {start: [start]}
  frontier = [start]
  while frontier:
    nxt = []
    for node in frontier:
      for child in sorted(graph[node]):
        if child == start:
          return paths[node] + [start]
        if child in members and child not in paths:
          paths[child] = paths[node] + [child]
          nxt.append(child)
    frontier = nxt
  return component


def test_the_package_imports_only_downward_and_without_cycles():
  with open(os.path.join(ROOT, 'docs', 'ARCHITECTURE.md'), encoding='utf-8') as f:
    layers = declared_layers(f.read())
  graph = import_graph(ROOT)
  assert len(graph) > 50   # The walk found the package (not an empty tree that passes).
  assert violations(graph, layers) == []


_TOY_LAYERS = [('top', ['pkg.app']), ('middle', ['pkg.core']), ('bottom', ['pkg.util', 'pkg'])]


@pytest.mark.parametrize('graph, expected', [
    ({'pkg.app': {'pkg.core'}, 'pkg.core': {'pkg.util'}, 'pkg.util': set()}, []),
    ({'pkg.app': set(), 'pkg.core': {'pkg.app'}, 'pkg.util': set()},
     ['upward import: pkg.core (middle) -> pkg.app (top)']),
    ({'pkg.core.a': {'pkg.core.b'}, 'pkg.core.b': {'pkg.core.c'}, 'pkg.core.c': {'pkg.core.a'}},
     ['import cycle: pkg.core.a -> pkg.core.b -> pkg.core.c -> pkg.core.a']),
    ({'other.x': set()}, ['other.x is in no declared layer']),
])
def test_the_checker_reports_upward_arrows_cycles_and_undeclared_modules(graph, expected):
  assert violations(graph, _TOY_LAYERS) == expected


def test_function_level_and_relative_imports_are_edges():
  source = ('import os\nfrom pkg.core import a\n'
            'def f():\n  from pkg.app import main  # lazy\n  from . import b\n')
  known = {'pkg.core.a', 'pkg.app', 'pkg.core.b', 'pkg.core.c'}
  assert imported_modules(source, 'pkg.core.c', False, known) == {'pkg.core.a', 'pkg.app',
                                                                  'pkg.core.b'}


_FLAG = re.compile(r'(?<![\w-])--[a-z][a-z_]*')


_COMMAND = re.compile(r'`python [^`]*`')   # Another program's command line, quoted whole.


def flags_named(source: str) -> list[str]:
  """`--flag`s that string literals of `source` name (docstrings aside; an f-string is read
  whole, its fields as {}), outside quoted `python ...` commands."""
  tree = ast.parse(source)
  skip = {id(node.body[0].value) for node in ast.walk(tree)   # Docstrings.
          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                               ast.AsyncFunctionDef))
          and node.body and isinstance(node.body[0], ast.Expr)
          and isinstance(node.body[0].value, ast.Constant)}
  texts = []
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):
      skip.update(id(v) for v in node.values)
      texts.append(''.join(v.value if isinstance(v, ast.Constant) else '{}'
                           for v in node.values))
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
          and id(node) not in skip):
      texts.append(node.value)
  return [m for text in texts for m in _FLAG.findall(_COMMAND.sub('', text))]


def test_library_messages_name_parameters_not_flags():
  """Only programs name flags: a module that parses its own command line (and cli_flags, which
  turns the library's `parameter` into --parameter for them) may; no other module does."""
  with open(os.path.join(ROOT, 'docs', 'ARCHITECTURE.md'), encoding='utf-8') as f:
    entry_points = dict(declared_layers(f.read()))['entry points']
  named = {}
  for module, path in module_files(ROOT).items():
    with open(path, encoding='utf-8') as f:
      source = f.read()
    if (module in entry_points or module == 'tff_dp.cli_flags' or 'DEFINE_' in source
        or 'argparse' in source):
      continue
    if flags_named(source):
      named[module] = flags_named(source)
  assert named == {}
  assert flags_named('"""Doc --a."""\nx = f"use --clip_norm {1}"\ny = "--"\n'
                     'z = f"`python -m w --port {1}` --b"\n') == ['--clip_norm', '--b']


def _imports_of(prefix: str, graph) -> set[str]:
  return {dst for src, dsts in graph.items() if src == prefix or src.startswith(prefix + '.')
          for dst in dsts}


def test_the_tables_read_run_directories_through_the_run_format_only():
  """Issue 26: the paper tables read what runs wrote through tff_dp.run_format, not through
  the training package that writes them; the run format imports neither, nor TensorFlow."""
  graph = import_graph(ROOT)
  tables = _imports_of('tff_dp.tables', graph)
  assert not {m for m in tables if m.startswith('tff_dp.training')}
  assert 'tff_dp.run_format.metrics_csv' in tables   # The walk saw the tables' imports.
  run_format = _imports_of('tff_dp.run_format', graph)
  assert not {m for m in run_format if m.startswith(('tff_dp.training', 'tff_dp.tables'))}
  for path in [f for m, f in module_files(ROOT).items() if m.startswith('tff_dp.run_format')]:
    with open(path, encoding='utf-8') as f:
      assert 'tensorflow' not in f.read(), path


# A module longer than this says at its top why (a line starting `Longer than`), issue 26.
MAX_MODULE_LINES = 350


def test_modules_fit_or_say_why():
  too_long = {}
  for module, path in module_files(ROOT).items():
    with open(path, encoding='utf-8') as f:
      lines = f.read().splitlines()
    if len(lines) > MAX_MODULE_LINES and not any(
        line.lstrip('# "').startswith('Longer than') for line in lines[:30]):
      too_long[module] = len(lines)
  assert too_long == {}


# The house's limits in the library, without waivers (issue 52).
MAX_LIBRARY_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def test_the_library_keeps_the_houses_limits():
  """No module of tff_dp over 450 lines and no function over 80 (ledger and sampling were split
  along their jobs; the run's composition and its statement cut by what they build and say)."""
  long_modules, long_functions = {}, {}
  for module, path in module_files(ROOT).items():
    if not module.startswith('tff_dp'):
      continue
    with open(path, encoding='utf-8') as f:
      text = f.read()
    if len(text.splitlines()) > MAX_LIBRARY_MODULE_LINES:
      long_modules[module] = len(text.splitlines())
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
          long_functions[f'{module}.{node.name}'] = length
  assert long_modules == {} and long_functions == {}
