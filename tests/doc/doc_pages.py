#!/usr/bin/env python3
"""doc_pages.py — the documentation's code and commands, checked against what they are.

    doc_pages.py --root SRC --check-snippets                   # every C++ block is a sample's region
    doc_pages.py --root SRC --check-markers                    # every command block is marked
    doc_pages.py --root SRC --build BUILD --page doc/zero.md   # run one page's command blocks

Snippets. Every ```cpp block of README.md and doc/*.md has, on the line before it,

    <!-- snippet: samples/FILE#NAME -->

and equals the region of samples/FILE between `// [snippet:NAME]` and `// [/snippet:NAME]` (the
indentation of the closing marker's line removed from each line). Only samples may be named: they are
installed with the package (share/flexpar/examples), and scripts/consumer-test builds each one a page
names from there against the installed package, as a reader who copies the block would.

Commands. In README.md, the guides and the zero / checkpoint / failures pages, each block of commands
(```sh or ```console, or one with `$ ` lines) has one of these lines right before its fence:

    <!-- run -->                 run it here (options: `<!-- run: timeout=120 -->`, seconds per command)
    <!-- not run: REASON -->     not run by the test, for the reason given (minutes, 8 ranks, a GPU, ...)

In a block, a line that starts with `$ ` is a command (a trailing backslash continues it on the next
line) and the lines after it, up to the next command, are what it prints: each of them must appear in
the command's output (stdout and stderr together), in that order, other lines may come between.
`…` in a shown line stands for any text (timings, pids, paths); a line that is only `…` says that
lines were left out. A command must exit 0; it runs under `bash -e -o pipefail`, so a failing
program inside a pipeline or a loop fails it too.

Commands run in a fresh temporary directory in which `build` is the build tree and every top-level
entry of the source tree (samples/, scripts/, ...) is linked, so a page's `build/samples/x` and
`bash samples/support/y.sh` work as written; files a command writes (checkpoints, timelines) land
there and are removed afterwards.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SNIPPET = re.compile(r"^<!-- snippet: (\S+)#(\S+) -->$")
PAGES = ["README.md", "doc/guide-collectives.md", "doc/guide-training.md", "doc/guide-parallel-models.md",
         "doc/zero.md", "doc/checkpoint.md", "doc/failures.md"]
FENCE = re.compile(r"^```")
RUN = re.compile(r"^<!-- run(?::\s*(.*?))?\s*-->$")
NOT_RUN = re.compile(r"^<!-- not run: \S.*-->$")


class block:
    def __init__(self, page, line, marker, lines, fence):
        self.page, self.line, self.marker, self.lines, self.fence = page, line, marker, lines, fence

    def is_commands(self):
        return self.fence in ("```sh", "```console") or any(l.startswith("$ ") for l in self.lines)


def blocks_of(root, page):
    """The fenced blocks of a page with the line before each."""
    text = open(os.path.join(root, page), encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(text):
        if FENCE.match(text[i]):
            start, fence = i, text[i].strip()
            j = i + 1
            while j < len(text) and not FENCE.match(text[j]):
                j += 1
            marker = text[start - 1].strip() if start > 0 else ""
            out.append(block(page, start + 1, marker, text[start + 1:j], fence))
            i = j + 1
        else:
            i += 1
    return out


def commands_of(b):
    """[(command, [shown lines])] of a block."""
    result, current = [], None
    lines = iter(b.lines)
    for l in lines:
        if l.startswith("$ "):
            cmd = l[2:]
            while cmd.endswith("\\"):
                cmd = cmd[:-1] + " " + next(lines, "").strip()
            current = (cmd, [])
            result.append(current)
        elif current is None:
            if l.strip():
                raise SystemExit(f"{b.page}:{b.line}: a run block must start with a `$ ` command line")
        elif l.strip():
            current[1].append(l.rstrip())
    return result


def pattern_of(shown):
    return re.compile(".*".join(re.escape(part) for part in shown.split("…")))


def region_of(root, sample, name):
    """The region NAME of SAMPLE, dedented by its closing marker's indentation; None when absent."""
    text = open(os.path.join(root, sample), encoding="utf-8").read()
    begin, end = f"// [snippet:{name}]\n", f"// [/snippet:{name}]"
    b, e = text.find(begin), text.find(end)
    if b < 0 or e < 0:
        return None
    region = text[b + len(begin):e]
    indent = region[len(region.rstrip(" ")):]
    region = region.rstrip(" ")
    lines = region.split("\n")
    return "\n".join(l[len(indent):] if l.startswith(indent) else l for l in lines)


def check_snippets(root):
    pages = ["README.md"] + sorted(os.path.join("doc", f) for f in os.listdir(os.path.join(root, "doc"))
                                   if f.endswith(".md"))
    bad, checked = [], 0
    for page in pages:
        for b in blocks_of(root, page):
            m = SNIPPET.match(b.marker)
            if not m:
                if b.fence == "```cpp":
                    bad.append(f"{page}:{b.line}: a ```cpp block without <!-- snippet: samples/FILE#NAME --> "
                               "before it: make it a region of a sample, so that it is compiled and checked")
                continue
            sample, name = m.groups()
            if not sample.startswith("samples/"):
                bad.append(f"{page}:{b.line}: the snippet names {sample}: a page shows regions of samples only "
                           "(samples/...), which are installed and built against the installed package")
                continue
            if not os.path.exists(os.path.join(root, sample)):
                bad.append(f"{page}:{b.line}: the snippet names {sample}, which does not exist")
                continue
            region = region_of(root, sample, name)
            shown = "\n".join(b.lines) + "\n"
            if region is None:
                bad.append(f"{page}:{b.line}: {sample} has no region [snippet:{name}]")
            elif shown != region:
                bad.append(f"{page}:{b.line}: the block differs from {sample}#{name}\n--- page:\n{shown}"
                           f"--- sample:\n{region}")
            else:
                checked += 1
    for line in bad:
        print(line)
    print(f"doc_pages: {checked} snippets match their samples, {len(bad)} problems")
    return 1 if bad or checked == 0 else 0


def check_markers(root):
    bad = []
    for page in PAGES:
        for b in blocks_of(root, page):
            if b.is_commands() and not (RUN.match(b.marker) or NOT_RUN.match(b.marker)):
                bad.append(f"{page}:{b.line}: a command block without <!-- run --> or <!-- not run: REASON --> before it")
    for line in bad:
        print(line)
    print(f"doc_pages: {len(PAGES)} pages, {len(bad)} unmarked command blocks")
    return 1 if bad else 0


def run_page(root, build, page):
    runs = [b for b in blocks_of(root, page) if RUN.match(b.marker)]
    if not runs:
        print(f"doc_pages: {page} has no <!-- run --> block")
        return 1
    failures = 0
    work = tempfile.mkdtemp(prefix="flexpar-doc-")
    try:
        for entry in os.listdir(root):
            if entry not in ("build", ".git"):
                os.symlink(os.path.join(root, entry), os.path.join(work, entry))
        os.symlink(os.path.abspath(build), os.path.join(work, "build"))
        for b in runs:
            options = dict(o.split("=", 1) for o in (RUN.match(b.marker).group(1) or "").split() if "=" in o)
            timeout = float(options.get("timeout", 120))
            for cmd, shown in commands_of(b):
                print(f"==== {page}:{b.line}: $ {cmd}", flush=True)
                try:
                    p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", cmd], cwd=work, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, timeout=timeout, text=True, errors="replace")
                    output, status = p.stdout, p.returncode
                except subprocess.TimeoutExpired as e:
                    output, status = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
                        else (e.stdout or ""), f"timeout after {timeout:.0f} s"
                sys.stdout.write(output)
                problems = []
                if status != 0:
                    problems.append(f"exit status {status} (0 expected)")
                out_lines = [l.rstrip() for l in output.split("\n")]
                k = 0
                for s in shown:
                    if s.strip() == "…":
                        continue
                    pat = pattern_of(s)
                    while k < len(out_lines) and not pat.fullmatch(out_lines[k]):
                        k += 1
                    if k == len(out_lines):
                        problems.append(f"the page shows a line the command did not print (in this order):\n    {s}")
                        break
                    k += 1
                for problem in problems:
                    print(f"FAILED {page}:{b.line}: `{cmd}`: {problem}")
                failures += bool(problems)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"doc_pages: {page}: {len(runs)} blocks run, {failures} commands failed")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--build")
    ap.add_argument("--page")
    ap.add_argument("--check-markers", action="store_true")
    ap.add_argument("--check-snippets", action="store_true")
    a = ap.parse_args()
    if a.check_snippets:
        return check_snippets(a.root)
    if a.check_markers:
        return check_markers(a.root)
    if not a.page or not a.build:
        ap.error("--page and --build, --check-markers or --check-snippets")
    return run_page(a.root, a.build, a.page)


if __name__ == "__main__":
    sys.exit(main())
