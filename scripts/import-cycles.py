#!/usr/bin/env python3
"""File-level import graph of the library's sources, and its cycles: no two files may import
each other (through any chain), so that each layer can be read on its own. Exits 1 if a
cycle exists (.ci/run runs it).

Edges: `use` trees (crate::, super::, self::, child-module-relative) and inline paths
(crate::a::b, super::x, child::x). Items reached through a re-export are followed to the
file that defines them. Usage: import-cycles.py <crate dir> [--edges] [--skip src/bin]
"""
import os, re, sys
from collections import defaultdict

root_dir = sys.argv[1]
show_edges = '--edges' in sys.argv
SRC = os.path.join(root_dir, 'src')

def strip(text):
    out = []; i = 0; n = len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i); i = n if j < 0 else j; continue
        if text.startswith('/*', i):
            depth = 0
            while i < n:
                if text.startswith('/*', i): depth += 1; i += 2
                elif text.startswith('*/', i):
                    depth -= 1; i += 2
                    if depth == 0: break
                else: i += 1
            out.append(' '); continue
        m = re.match(r'b?r(#*)"', text[i:i+10])
        if m and (i == 0 or not (text[i-1].isalnum() or text[i-1] == '_')):
            hashes = m.group(1); end = '"' + hashes
            j = text.find(end, i + len(m.group(0)))
            out.append('""'); out.append('\n' * text.count('\n', i, j)); i = j + len(end); continue
        if c == '"' or (c == 'b' and text.startswith('b"', i)):
            j = i + (2 if c == 'b' else 1)
            while text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            out.append('""'); i = j + 1; continue
        if c == "'":
            m = re.match(r"'(\\.|\\x[0-9a-fA-F]{2}|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:i+12])
            if m: out.append("' '"); i += len(m.group(0)); continue
        out.append(c); i += 1
    return ''.join(out)

TOK = re.compile(r'::|[A-Za-z_][A-Za-z0-9_]*|\S')

class Mod:
    def __init__(s, path, file, parent):
        s.path, s.file, s.parent = path, file, parent
        s.children = {}; s.uses = {}; s.globs = []; s.refs = []  # refs: (abs segs, kind)

mods = {}
def new_mod(path, file, parent):
    m = Mod(path, file, parent); mods[path] = m
    if parent is not None: mods[parent].children[path[-1]] = path
    return m

def mod_file(parent_file, name, parent_is_dir_owner):
    base = os.path.dirname(parent_file) if parent_is_dir_owner else os.path.splitext(parent_file)[0]
    for c in (os.path.join(base, name + '.rs'), os.path.join(base, name, 'mod.rs')):
        if os.path.exists(c): return c
    return None

def owns_dir(f):
    b = os.path.basename(f)
    return b in ('mod.rs', 'lib.rs', 'main.rs')

def parse_use_tree(toks, i, prefix, out):
    # returns index after tree; appends (segs, alias, is_glob)
    segs = list(prefix)
    while True:
        t = toks[i]
        if t == '{':
            i += 1
            while toks[i] != '}':
                i = parse_use_tree(toks, i, segs, out)
                if toks[i] == ',': i += 1
            return i + 1
        if t == '*':
            out.append((segs, None, True)); return i + 1
        if t == '::': i += 1; continue
        segs = segs + [t]; i += 1
        if toks[i] == '::': continue
        alias = segs[-1]
        if toks[i] == 'as': alias = toks[i+1]; i += 2
        if segs[-1] == 'self': segs = segs[:-1]; alias = segs[-1] if alias == 'self' else alias
        out.append((segs, alias, False)); return i

pending = []  # (Mod, kind, rel segs, line)
def parse_file(path_mod, file):
    text = strip(open(file).read())
    toks = []; lines = []
    for m in TOK.finditer(text):
        toks.append(m.group(0)); lines.append(text.count('\n', 0, m.start()) + 1)
    toks.append(';'); lines.append(0)
    stack = [(path_mod, -1, False)]  # module path, brace depth at open, cfg(test)
    depth = 0; i = 0
    test_attr = False
    while i < len(toks) - 1:
        t = toks[i]
        cur, _, in_test = stack[-1]
        if t == '#' and toks[i+1] == '[':
            j = i + 2; d = 1; attr = []
            while d:
                if toks[j] == '[': d += 1
                elif toks[j] == ']': d -= 1
                attr.append(toks[j]); j += 1
            if attr[:3] == ['cfg', '(', 'test'] or attr[:5] == ['cfg', '(', 'all', '(', 'test']: test_attr = True
            i = j; continue
        if t == '{': depth += 1; i += 1; continue
        if t == '}':
            depth -= 1
            if stack[-1][1] == depth: stack.pop()
            i += 1; continue
        if t == 'mod' and re.match(r'[A-Za-z_]', toks[i+1]):
            name = toks[i+1]
            if toks[i+2] == ';':
                f = mod_file(mods[cur].file, name, owns_dir(mods[cur].file) and cur == path_mod)
                if f and not f.startswith(os.path.join(SRC, 'bin')):
                    new_mod(cur + (name,), f, cur); parse_file(cur + (name,), f)
                i += 3; test_attr = False; continue
            if toks[i+2] == '{':
                m = new_mod(cur + (name,), mods[cur].file, cur)
                stack.append((cur + (name,), depth, in_test or test_attr)); depth += 1
                i += 3; test_attr = False; continue
        if t == 'use':
            out = []; j = parse_use_tree(toks, i + 1, [], out)
            for segs, alias, glob in out:
                pending.append((mods[cur], 'use', segs, alias, glob, lines[i], in_test or test_attr))
            i = j; test_attr = False; continue
        if t in ('crate', 'super', 'self') or (t in mods[cur].children and toks[i+1] == '::'):
            if i > 0 and toks[i-1] == '::': i += 1; continue
            segs = [t]; j = i + 1
            while toks[j] == '::' and re.match(r'[A-Za-z_]', toks[j+1]):
                segs.append(toks[j+1]); j += 2
            if len(segs) > 1:
                pending.append((mods[cur], 'path', segs, None, False, lines[i], in_test or test_attr))
            i = j; continue
        if t in (';', '}'): test_attr = False
        if t == 'fn' or t == 'struct' or t == 'impl' or t == 'enum': test_attr = test_attr
        i += 1

lib = os.path.join(SRC, 'lib.rs')
new_mod((), lib, None); parse_file((), lib)

def absolute(m, segs):
    segs = list(segs)
    base = m.path
    if not segs: return None
    if segs[0] == 'crate': base = (); segs = segs[1:]
    elif segs[0] in ('super', 'self'):
        while segs and segs[0] in ('super', 'self'):
            if segs[0] == 'super': base = mods[base].parent
            segs = segs[1:]
    elif segs[0] in m.children: pass
    elif segs[0] in m.uses: return m.uses[segs[0]] + segs[1:]
    else: return None  # external crate or std
    return list(base) + segs

# Bind use names per module first (for re-export following).
for m, kind, segs, alias, glob, line, test in pending:
    if kind != 'use': continue
    a = absolute(m, segs)
    if a is None: continue
    if glob: m.globs.append(a)
    else: m.uses[alias] = a

def resolve(a, seen=()):
    """absolute segs -> (defining file, via re-export files)"""
    node = ()
    for k, seg in enumerate(a):
        if seg in mods[node].children: node = mods[node].children[seg]; continue
        key = (node, seg)
        if key in seen: return mods[node].file, []
        if seg in mods[node].uses:
            f, via = resolve(mods[node].uses[seg] + a[k+1:], seen + (key,))
            return f, [mods[node].file] + via
        for g in mods[node].globs:
            gn = tuple(g)
            if gn in mods and gn != node and (seg in mods[gn].uses or seg in mods[gn].children or True):
                f, via = resolve(g + a[k:], seen + (key,))
                if f != mods[gn].file or True:
                    return f, [mods[node].file] + via
        return mods[node].file, []
    return mods[node].file, []

edges = defaultdict(list)
through_root = []
for m, kind, segs, alias, glob, line, test in pending:
    a = absolute(m, segs)
    if a is None: continue
    if glob:
        f, via = resolve(a + ['*']) if a else (lib, [])
        f = mods[tuple(a)].file if tuple(a) in mods else f
    else:
        f, via = resolve(a)
    rel = os.path.relpath(m.file, root_dir); to = os.path.relpath(f, root_dir)
    if lib in via and m.file != lib:
        through_root.append(f"{rel}:{line}: {'::'.join(segs)} (via lib.rs -> {to})")
    if f == m.file: continue
    edges[rel].append((to, line, '::'.join(segs), test))

files = sorted({os.path.relpath(x.file, root_dir) for x in mods.values()})
graph = {f: sorted({t for t, *_ in edges.get(f, [])}) for f in files}

# Tarjan SCC
index = {}; low = {}; onstack = set(); st = []; sccs = []; cnt = [0]
sys.setrecursionlimit(10000)
def sc(v):
    index[v] = low[v] = cnt[0]; cnt[0] += 1; st.append(v); onstack.add(v)
    for w in graph.get(v, []):
        if w not in index: sc(w); low[v] = min(low[v], low[w])
        elif w in onstack: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = st.pop(); onstack.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in files:
    if v not in index: sc(v)

def why(a, b):
    return sorted({f"{l}:{p}{' [test]' if t else ''}" for to, l, p, t in edges[a] if to == b})

print(f"{len(files)} files, {sum(len(v) for v in graph.values())} file-to-file edges")
if show_edges:
    for f in files:
        for t in graph[f]: print(f"  {f} -> {t}")
from collections import deque
def shortest_cycle(start, comp):
    prev = {start: None}; q = deque([start])
    while q:
        v = q.popleft()
        for w in graph[v]:
            if w not in comp: continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None: path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev: prev[w] = v; q.append(w)
    return None

if not sccs: print("no import cycles between files")
for comp in sccs:
    print(f"strongly connected: {len(comp)} files import one another through cycles")
    seen = set()
    for v in comp:
        c = shortest_cycle(v, set(comp))
        key = frozenset(zip(c, c[1:]))
        if key in seen: continue
        seen.add(key)
        print("  cycle: " + " -> ".join(c))
        for a, b in zip(c, c[1:]):
            print(f"      {a} -> {b}: {'; '.join(why(a, b))}")

# The same graph between top-level modules (a folder, or a file under src/).
def top(f):
    parts = f.split('/')
    return '/'.join(parts[:2]) + ('/' if len(parts) > 2 else '')
mgraph = defaultdict(set)
for a, ts in graph.items():
    for b in ts:
        if top(a) != top(b) and top(a) != 'src/lib.rs' : mgraph[top(a)].add(top(b))
pairs = sorted({tuple(sorted((a, b))) for a in mgraph for b in mgraph[a] if a in mgraph.get(b, ())})
print("top-level modules importing each other: " + (", ".join(f"{a} <-> {b}" for a, b in pairs) or "none"))
for a, b in pairs:
    for x, y in ((a, b), (b, a)):
        es = sorted(f"{f} -> {t}" for f in graph for t in graph[f] if top(f) == x and top(t) == y)
        print(f"    {x} -> {y}: " + "; ".join(es))
print(f"{len(through_root)} imports through the crate root's re-exports")
for x in through_root: print("    " + x)
sys.exit(1 if sccs else 0)
