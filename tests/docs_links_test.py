#!/usr/bin/env python3
"""Checks that the Markdown docs point at things that exist.

Rules, for every *.md file of the repository (tracked, or new and not ignored):
  1. Links. Every inline link or image `[text](target)` outside code must resolve: `target`
     relative to the file's directory (or to the repository root when it starts with '/') is an
     existing file or directory. `#anchor` (alone: this file) must match a heading of the target
     Markdown file, slugged as GitHub does (lower case, punctuation dropped, spaces to '-',
     '-1', '-2', ... for repeated headings). Links with a scheme (http:, https:, mailto:) are not
     fetched.
  2. Cited paths. An inline code span (`...`, outside fenced blocks) is a cited repository path
     when it is a single token with a '/' whose first component is a top-level directory of the
     repository (server/, client/, kernels/, proto/, deploy/, tests/, docs/, cmake/, .ci/, ...),
     or is the name of a top-level file (README.md, CMakeLists.txt, ...). A trailing ':LINE' is
     ignored; spans with wildcards or placeholders ('*', '{', '<', '$', '...') are not paths.
     The path must exist from the repository root; a trailing '/' requires a directory.
  3. Nothing refers to the team workspace's ../shared/ (the design lives in docs/design.md): no
     text file of the repository may contain '../shared/'.
Every failure is printed as FILE:LINE: reason; the exit status is 1 if there is any.
"""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Paths the docs may cite before they exist (a path listed here that exists is reported, so the
# list cannot go stale). Keep it empty unless a document describes work in progress.
NOT_YET_EXISTING: set = set()

# Files allowed to cite ../shared/ (a listed file without the reference is reported). Nothing in
# the repository may point outside it.
SHARED_REFERENCE_ALLOWED: set = set()

SKIP_DIRS = {".git", "Testing"}
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
NOT_A_PATH = ("*", "{", "<", "$", "...", " ", "\t")


def repository_files():
    """Tracked files plus new files git does not ignore; a walk of the tree without git."""
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            check=True,
            capture_output=True,
        ).stdout
        names = [n for n in out.decode().split("\0") if n]
        return sorted({n for n in names if (ROOT / n).is_file()})
    except (OSError, subprocess.CalledProcessError):
        names = []
        for directory, subdirs, files in os.walk(ROOT):
            subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS and not d.startswith("build")]
            for f in files:
                names.append(str((pathlib.Path(directory) / f).relative_to(ROOT)))
        return sorted(names)


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, result = {}, set()
        for line, _ in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        cache[path] = result
    return cache[path]


def prose_lines(path):
    """(line, number) for the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line, number


def check_link(md, number, target, errors):
    if not target or SCHEME.match(target):
        return
    path_part, _, anchor = target.partition("#")
    if path_part:
        base = ROOT if path_part.startswith("/") else md.parent
        resolved = (base / path_part.lstrip("/")).resolve()
        if not resolved.exists():
            errors.append(f"{md.relative_to(ROOT)}:{number}: link target '{target}' does not exist")
            return
        if ROOT != resolved and ROOT not in resolved.parents:
            errors.append(f"{md.relative_to(ROOT)}:{number}: link '{target}' leaves the repository")
            return
    else:
        resolved = md
    if anchor and resolved.suffix == ".md" and resolved.is_file():
        if anchor not in anchors(resolved):
            errors.append(
                f"{md.relative_to(ROOT)}:{number}: no heading '#{anchor}' in "
                f"{resolved.relative_to(ROOT)}"
            )


def cited_path(span, top_dirs, top_files):
    token = span.strip()
    if not token or any(s in token for s in NOT_A_PATH):
        return None
    token = re.sub(r":\d+(-\d+)?$", "", token)
    if token in top_files:
        return token
    first, sep, _ = token.partition("/")
    if sep and first in top_dirs:
        return token
    return None


def check_cited(md, number, path, errors, used_allowlist):
    if path in NOT_YET_EXISTING:
        used_allowlist.add(path)
        return
    target = ROOT / path
    if path.endswith("/") and not target.is_dir():
        errors.append(f"{md.relative_to(ROOT)}:{number}: cited directory `{path}` does not exist")
    elif not target.exists():
        errors.append(f"{md.relative_to(ROOT)}:{number}: cited path `{path}` does not exist")


def main():
    errors = []
    files = repository_files()
    top_dirs = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and p.name not in SKIP_DIRS and not p.name.startswith("build")
    }
    top_files = {n for n in files if "/" not in n}
    used_allowlist = set()

    for name in files:
        if not name.endswith(".md"):
            continue
        md = ROOT / name
        for line, number in prose_lines(md):
            for m in CODE_SPAN.finditer(line):
                path = cited_path(m.group(2), top_dirs, top_files)
                if path:
                    check_cited(md, number, path, errors, used_allowlist)
            without_code = CODE_SPAN.sub("", line)
            for m in LINK.finditer(without_code):
                check_link(md, number, m.group(1), errors)

    for path in sorted(NOT_YET_EXISTING):
        if (ROOT / path).exists():
            errors.append(f"{__file__}: `{path}` exists now: remove it from NOT_YET_EXISTING")

    for name in files:
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text
        if name == "tests/docs_links_test.py":
            continue  # this file names the rule
        has = "../shared/" in text
        if has and name not in SHARED_REFERENCE_ALLOWED:
            for number, line in enumerate(text.splitlines(), 1):
                if "../shared/" in line:
                    errors.append(f"{name}:{number}: refers to ../shared/ (use docs/design.md)")
        elif not has and name in SHARED_REFERENCE_ALLOWED:
            errors.append(
                f"{__file__}: {name} no longer refers to ../shared/: remove it from "
                "SHARED_REFERENCE_ALLOWED"
            )

    for e in errors:
        print(e)
    checked = sum(1 for n in files if n.endswith(".md"))
    print(f"docs_links_test: {checked} Markdown files, {len(errors)} failures")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
