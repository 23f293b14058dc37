#!/usr/bin/env python3
"""Checks relative links and #anchors in the given markdown files (GitHub slug rules); exits 1
if one is broken (.ci/run runs it on README.md, CHANGELOG.md and docs/)."""
import os, re, sys

def slug(text):
    t = re.sub(r'`', '', text.strip().lower())
    t = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', t)
    t = re.sub(r'[^\w\- ]', '', t)          # drop punctuation (keeps letters, digits, _, -)
    return t.replace(' ', '-')

def anchors(path):
    out, seen = set(), {}
    in_code = False
    for line in open(path, encoding='utf-8'):
        if line.startswith('```'):
            in_code = not in_code
            continue
        if in_code:
            continue
        m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f'{s}-{n}')
    return out

bad = 0
for md in sys.argv[1:]:
    text = open(md, encoding='utf-8').read()
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    text = re.sub(r'`[^`\n]*`', lambda m: '' if '](' not in m.group(0) else m.group(0), text)
    for m in re.finditer(r'\[[^\]]*\]\(([^)\s]+)\)', text):
        target = m.group(1)
        if re.match(r'^[a-z]+://', target) or target.startswith('mailto:'):
            continue
        file, _, frag = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(md), file)) if file else md
        if not os.path.exists(dest):
            print(f'{md}: missing file {target}'); bad += 1; continue
        if frag and dest.endswith('.md') and frag not in anchors(dest):
            print(f'{md}: missing anchor {target}'); bad += 1
print(f'{bad} broken link(s)')
sys.exit(1 if bad else 0)
