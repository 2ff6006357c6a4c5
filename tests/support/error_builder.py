#!/usr/bin/env python3
"""tests/support/error_builder.py — every throw of include/flexpar/** and lib/** builds its message with
core/error.hpp's builder, so that each reads "[rank R] op: what" (doc/architecture.md, "Error messages").

A `throw` passes when it is one of:
  - `throw;` (a rethrow), or `throw e;` / `throw std::move(e);`: an exception object built elsewhere;
  - a throw whose expression calls the builder: error_on<E>(...), error_text(...), on_rank(...),
    rank_prefix(...), api_failure_text(...);
  - a throw whose expression calls a wrapper of the builder: a function or lambda of include/ or lib/
    whose body calls the builder or another wrapper (relax's `where`, checkpoint's `bad`, ZeRO's `fail`:
    a layer's own context, never the prefix written again);
  - `throw E(text)` (or `E(text + ...)`, `E(text.append(...))`) where `text` was declared, earlier in the
    file, from the builder or a wrapper (`std::string text = error_text(...); text += ...;`);
  - a throw marked `// throw: <why it cannot use the builder>` at the end of its line or on the line
    above (e.g. code that must not allocate).
Anything else fails, naming file:line and the throw's first line.

  tests/support/error_builder.py --root .            # the check (exit status 1 on a stray throw)
  tests/support/error_builder.py --root . --list     # also print every throw and the form it passed as
  tests/support/error_builder.py --root . --planted  # proves the check can fail (see planted() below)
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planted_copy import prove_it_fails  # noqa: E402

SOURCE = re.compile(r"\.(hpp|cpp|h|cu|cuh)$")
MARKER = re.compile(r"//\s*throw:\s*\S")
BUILDER = re.compile(r"\b(error_on\s*<|error_text\s*\(|on_rank\s*\(|rank_prefix\s*\(|api_failure_text\s*\()")
KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "static_assert", "throw",
            "alignof", "noexcept", "requires", "defined", "operator", "constexpr"}
# Names of the standard library's members: a wrapper of that name (ZeRO's at(op)) is taken for a
# call of it alone, not for `v.at(i)` or `p->at(i)`.
STD_NAMES = {"at", "get", "data", "size", "find", "count", "what", "str", "c_str", "append", "begin", "end"}

# Files being rewritten now, whose throws are not checked until the rewrite lands and converts them
# (one path a line, with the rewrite's item). Remove a line once its file's throws use the builder.
SKIPPED = set()
SKIPPED_FOLDERS = ()


def skipped(rel):
    return rel in SKIPPED or rel.startswith(SKIPPED_FOLDERS)


def code_only(text):
    """`text` with comments and the contents of string and char literals blanked (newlines kept), so
    that offsets and line numbers stay those of the file."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i + 2)
            end = ")" + text[i + 2:k] + '"'
            j = text.find(end, k)
            j = n if j < 0 else j + len(end)
            out.append('R"' + "".join(ch if ch == "\n" else " " for ch in text[i + 2:j - 1]) + '"')
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(code, start, open_ch="{", close_ch="}"):
    """Offset just past the bracket that closes the one at `start`."""
    depth = 0
    for k in range(start, len(code)):
        if code[k] == open_ch:
            depth += 1
        elif code[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k + 1
    return len(code)


def throw_expression(code, at):
    """The expression of the throw at offset `at` (after the keyword) up to the `;`, `,`, `:` or closing
    bracket that ends it."""
    depth, k = 0, at
    while k < len(code):
        c = code[k]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and (c in ";," or (c == ":" and code[k + 1:k + 2] != ":" and code[k - 1:k] != ":")):
            break
        k += 1
    return code[at:k].strip()


DEFINITIONS = [
    # auto name = [captures](params) ... {
    re.compile(r"\bauto\s+(\w+)\s*=\s*\[[^\]]*\]\s*\([^)]*\)[^{;]*\{"),
    # [type] name(params) [const] [noexcept] [-> type] {   (a function, or a member function)
    re.compile(r"\b(\w+)\s*\(([^;{}()]|\([^;{}()]*\))*\)\s*(const\s*)?(noexcept\s*)?(->\s*[\w:<>, ]+)?\{"),
]


def depth_at(body, at):
    """The brace depth at offset `at` of a body that starts with its `{` (1: the body's own statements)."""
    return body.count("{", 0, at) - body.count("}", 0, at)


def wrappers(files):
    """{file: names of the functions and lambdas (of at most 30 lines) that return what the builder or
    (transitively) another wrapper returns: a built message, prefix or exception, or a variable declared
    from one (`std::string text = on_rank(...); text += ...; return text;`)}. A function of a header, or
    of a source file that a header declares, counts in every file; a lambda only in its own file."""
    header = re.compile(r"\.(hpp|cuh|h)$")
    declared = set()
    for rel, code in files:
        if header.search(rel):
            declared |= set(re.findall(r"\b(\w+)\s*\([^;{}()]*\)\s*(?:const\s*)?(?:noexcept\s*)?;", code))
    bodies = []
    for rel, code in files:
        for lambda_, pattern in ((True, DEFINITIONS[0]), (False, DEFINITIONS[1])):
            for m in pattern.finditer(code):
                name = m.group(1)
                if name in KEYWORDS:
                    continue
                body = code[m.end() - 1:matching(code, m.end() - 1)]
                returned = [body[r.end():body.find(";", r.end())] for r in re.finditer(r"\breturn\b", body)
                            if depth_at(body, r.start()) == 1]
                if returned and body.count("\n") <= 30:
                    shared = not lambda_ and (header.search(rel) or name in declared)
                    bodies.append((rel, name, returned, body, shared))
    shared, local = set(), {rel: set() for rel, _ in files}
    while True:
        more = False
        for rel, name, returned, body, is_shared in bodies:
            mine = shared if is_shared else local[rel]
            if name in mine:
                continue
            known = shared | local[rel]
            if any(starts_with_builder(e, known) or declared_from_builder(returned_text(e), body, known) for e in returned):
                mine.add(name)
                more = True
        if not more:
            return {rel: shared | names for rel, names in local.items()}


def returned_text(expression):
    """`text` of a returned `text` or `E(text)`, else ''."""
    m = re.fullmatch(r"\s*(?:[\w:]+\s*\(\s*)?(\w+)\s*\)?\s*", expression)
    return m.group(1) if m else ""


def declared_from_builder(name, code, known):
    """Whether the variable `name` is declared in `code` from the builder or a wrapper."""
    if not re.fullmatch(r"\w+", name):
        return False
    for d in re.finditer(r"(?:std::string|auto)\s+" + name + r"\s*(=|\(|\{)", code):
        end = code.find(";", d.end())
        initializer = code[d.end():end if end >= 0 else len(code)]
        if builds(initializer, known):
            return True
        # std::string text(at): a copy of a text declared from the builder before it
        m = re.fullmatch(r"\s*(\w+)\s*[)}]?\s*", initializer)
        if m and m.group(1) != name and declared_from_builder(m.group(1), code[:d.start()], known):
            return True
    return False


def starts_with_builder(expression, known):
    """Whether a returned expression is a call of the builder or of one of the `known` wrappers (what it
    returns is then a built message, prefix or exception: `return on_rank(r, op);`)."""
    m = re.match(r"\s*(?:[\w]+::)*(\w+)\s*[<(]", expression)
    return bool(m) and (m.group(1) in ("error_on", "error_text", "on_rank", "rank_prefix", "api_failure_text") or m.group(1) in known)


def builds(expression, known):
    """Whether `expression` calls the builder or one of the `known` wrappers."""
    if BUILDER.search(expression):
        return True
    return any(m.group(2) in known and not (m.group(2) in STD_NAMES and m.group(1))
               for m in re.finditer(r"(\.|->)?\s*\b(\w+)\s*\(", expression))


def form_of(expression, code, at, known):
    """The allowed form a throw's expression has, or None."""
    if expression == "":
        return "rethrow"
    if re.fullmatch(r"(std::move\s*\(\s*)?[\w:.>\-\[\]]+\s*\)?", expression) and not expression.endswith("()"):
        return "built object"
    if BUILDER.search(expression):
        return "builder"
    if builds(expression, known):
        return "wrapper"
    # E(text), E(text + ...), E(text.append(...)): text declared earlier from the builder.
    m = re.match(r"[\w:]+\s*\(\s*(?:std::move\s*\(\s*)?(\w+)\b", expression)
    if m:
        if declared_from_builder(m.group(1), code[max(0, at - 8000):at], known):
            return "text from the builder"
    return None


def read_tree(root):
    files = []
    for top in ("include/flexpar", "lib"):
        for dirpath, dirnames, names in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(names):
                if SOURCE.search(name):
                    path = os.path.join(dirpath, name)
                    with open(path, errors="replace") as f:
                        text = f.read()
                    files.append((os.path.relpath(path, root), text))
    return files


def check(root, listing=None):
    """(errors, counts by form) of the tree at `root`."""
    files = read_tree(root)
    codes = [(rel, code_only(text)) for rel, text in files]
    known = wrappers(codes)
    errors, counts = [], {}
    for (rel, text), (_, code) in zip(files, codes):
        lines = text.split("\n")
        for m in re.finditer(r"\bthrow\b", code):
            n = code.count("\n", 0, m.start()) + 1
            if skipped(rel):
                form = "skipped file"
            else:
                expression = throw_expression(code, m.end())
                form = form_of(expression, code, m.start(), known[rel])
                if form is None and (MARKER.search(lines[n - 1]) or (n > 1 and MARKER.search(lines[n - 2]))):
                    form = "marked"
            counts[form or "stray"] = counts.get(form or "stray", 0) + 1
            if listing is not None:
                listing.append(f"{rel}:{n}: {form or 'STRAY'}: {lines[n - 1].strip()}")
            if form is None:
                errors.append(f"{rel}:{n}: a throw that does not build its message with core/error.hpp's "
                              f"error_on/error_text (nor is marked '// throw: <why>'): {lines[n - 1].strip()}")
    return errors, counts


def planted(root):
    """Copies include/ and lib/ into a temporary tree, checks that the copy passes, plants a throw of a
    hand-written message and checks that the check fails naming its file and line."""
    victim = "lib/core/config.cpp"

    def plant(lines):
        at = max(i for i, l in enumerate(lines) if l.startswith("}")) + 1
        lines[at:at] = ["", "void planted_fault() { throw flexpar::usage_error(\"config: a hand-written message\"); }"]
        return lines, at + 2

    return prove_it_fails(__file__, root, ("include", "lib"), (), victim, plant,
                          lambda line: f"{victim}:{line}: a throw that does not build its message", "planted throw")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--list", action="store_true", help="print every throw and the form it passed as")
    ap.add_argument("--planted", action="store_true", help="prove on a copy with a planted throw that the check fails")
    args = ap.parse_args()
    if args.planted:
        return planted(args.root)
    listing = [] if args.list else None
    errors, counts = check(args.root, listing)
    if listing:
        print("\n".join(listing))
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if errors:
        print("\n".join(errors))
        print(f"error builder: {len(errors)} throw(s) that do not use core/error.hpp's builder ({summary})")
        return 1
    print(f"error builder: every throw of include/ and lib/ uses core/error.hpp's builder or says why ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
