#!/usr/bin/env python3
"""Extracts Apple's Metal API (selectors, return and argument types, enum
constants) from Apple's metal-cpp headers into tests/metal/apple_api.txt.

Run by hand, once per metal-cpp version; the output is committed so that the
drift check (metal_api_drift.c, a ctest test) needs neither the tarball nor
Python:
    python3 tests/metal/tools/extract_apple_api.py metal-cpp-0f5e598.tar.gz > tests/metal/apple_api.txt

Types are written in the drift check's canonical spelling (see canon()):
`MTL::Buffer*` -> `MTLBuffer*`, `NS::UInteger` -> `NSUInteger`, `bool` ->
`BOOL`, blocks and handler functions -> `block`, no const / class keywords.
"""
import re
import sys
import tarfile


def canon(t):
    t = t.strip()
    if '^' in t or 'std::function' in t or re.search(r'Handler(Function)?\b', t):
        return 'block'
    t = re.sub(r'\b(const|class|struct)\b', ' ', t)
    t = t.replace('&', ' ')
    t = t.replace('NS::', 'NS').replace('MTL::', 'MTL')
    t = re.sub(r'\bbool\b', 'BOOL', t)
    t = re.sub(r'\s+', '', t)
    return t


def split_params(p):
    out, depth, cur = [], 0, ''
    for c in p:
        if c in '(<':
            depth += 1
        elif c in ')>':
            depth -= 1
        if c == ',' and depth == 0:
            out.append(cur)
            cur = ''
        else:
            cur += c
    if cur.strip():
        out.append(cur)
    return out


def param_type(p):
    p = p.strip()
    if '^' in p:
        return 'block'
    p = re.sub(r'=.*$', '', p).strip()          # default argument
    p = re.sub(r'\[\s*\]$', '', p).strip()
    m = re.match(r'^(.*?)([A-Za-z_]\w*)$', p)    # drop the parameter name
    if m and m.group(1).strip() and not m.group(1).strip().endswith('::'):
        p = m.group(1)
    return canon(p)


def main():
    tar = tarfile.open(sys.argv[1])
    files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()
             if m.isfile() and m.name.endswith('.hpp') and '/Metal/' in m.name}
    bridge = next(v for k, v in files.items() if k.endswith('MTLHeaderBridge.hpp'))
    sels = dict(re.findall(r'_MTL_PRIVATE_DEF_SEL\(\s*(\w+)\s*,\s*"([^"]*)"\s*\)', bridge))

    entries, consts = set(), {}
    for name, text in sorted(files.items()):
        # enums and options
        for kind, body in re.findall(r'_MTL_(ENUM|OPTIONS)\([^,]+,\s*\w+\)\s*\{(.*?)\}', text, re.S):
            for cname, val in re.findall(r'(\w+)\s*=\s*([^,\n]+)', body):
                expr = val.strip()
                try:
                    v = eval(re.sub(r'\b(\d+)[uUlL]+\b', r'\1', expr), {}, dict(consts))
                except Exception:
                    continue
                consts['MTL' + cname] = int(v)
                consts[cname] = int(v)
        # methods: _MTL_INLINE <ret> MTL::<Class>::<meth>(<params>) [const] { ... }
        for ret, cls, meth, params, body in re.findall(
                r'_MTL_INLINE\s+(.+?)\s+MTL::(\w+)::(\w+)\s*\(([^)]*(?:\([^)]*\)[^)]*)*)\)\s*(?:const)?\s*\{(.*?)\n\}', text, re.S):
            m = re.search(r'_MTL_PRIVATE_SEL\(\s*(\w+)\s*\)', body)
            if not m or m.group(1) not in sels:
                continue
            sel = sels[m.group(1)]
            types = [param_type(p) for p in split_params(params)]
            if sel.count(':') != len(types):
                continue  # a convenience overload (fewer arguments than the selector)
            entries.add(('sel', 'MTL' + cls, sel, canon(ret), ' '.join(types)))
        for ret, fn in re.findall(r'extern "C"\s+(.+?)\s+(MTL\w+)\s*\(\s*\)\s*;', text):
            entries.add(('func', '-', fn, canon(ret), ''))

    print('# Apple\'s Metal API as spelled in metal-cpp (github tako3/metal-cpp 0f5e598),')
    print('# extracted by tests/metal/tools/extract_apple_api.py; do not edit by hand')
    print('# except in the section at the end. Lines:')
    print('#   sel <protocol or class> <selector> | <return> | <argument types>')
    print('#   func - <function> | <return> |')
    print('#   const <name> <value>')
    for e in sorted(entries):
        print('%s %s %s | %s | %s' % e)
    for k in sorted(consts):
        if k.startswith('MTL'):
            print('const %s %d' % (k, consts[k]))


if __name__ == '__main__':
    main()
