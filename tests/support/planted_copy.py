"""planted_copy.py — what the source checks of tests/support share to prove they can fail: a copy of the
tree's sources in a temporary folder, the check run on it (it must pass), one fault planted in one file,
the check run again (it must fail and print the expected line)."""
import os
import shutil
import subprocess
import sys
import tempfile


def prove_it_fails(script, root, folders, files, victim, plant, expected, what):
    """Copies `folders` and `files` of `root`, runs `script --root COPY` (must exit 0), replaces the lines
    of `victim` by plant(lines) -> (lines, 1-based line of the fault), runs it again and checks that it
    exits non-zero printing `expected(line)`. `what` names the fault in the output. Returns the exit code
    for the test: 0 when the check caught the fault."""
    with tempfile.TemporaryDirectory(prefix=os.path.basename(script) + ".") as tmp:
        for d in folders:
            shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
        for f in files:
            os.makedirs(os.path.dirname(os.path.join(tmp, f)), exist_ok=True)
            shutil.copy(os.path.join(root, f), os.path.join(tmp, f))
        me = [sys.executable, os.path.abspath(script), "--root", tmp]
        clean = subprocess.run(me, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if clean.returncode != 0:
            print(f"planted: the unplanted copy fails already (exit {clean.returncode}):\n{clean.stdout}")
            return 1
        path = os.path.join(tmp, victim)
        with open(path) as f:
            lines, line = plant(f.read().split("\n"))
        with open(path, "w") as f:
            f.write("\n".join(lines))
        bad = subprocess.run(me, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(f"planted: {victim}:{line}: {what}; the check says (exit {bad.returncode}):\n{bad.stdout}", end="")
        want = expected(line)
        if bad.returncode == 0 or want not in bad.stdout:
            print(f"planted: FAILED: expected a non-zero exit and a line starting '{want}'")
            return 1
        print(f"planted: the check caught the {what}")
        return 0
