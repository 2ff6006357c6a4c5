#!/usr/bin/env bash
# run_guide_commands.sh SOURCE_DIR BUILD_DIR — runs every command of the user guides as written.
#
# The guides (doc/guide-*.md) are what a new user copies. This installs BUILD_DIR (an already built
# flexpar) into a temporary prefix, points PKG_CONFIG_PATH at it, saves the collectives guide's program
# as app.cpp (its first C++ block: the program the guide tells the reader to save), and then runs, in
# a directory where build/ is BUILD_DIR, every command the guides show, in order: each inline code span
# and each line of a ```sh block that starts with MPICH's compiler or launcher (mpicxx.mpich,
# mpiexec.mpich -n <digits>) or with a program of the build (build/...), after any VAR=value
# assignments. Every command must exit 0 within FLEXPAR_GUIDE_TIMEOUT seconds (default 300), and every
# guide must show at least one, here or in a <!-- run --> block (tests/doc/doc_pages.py runs those and
# compares their output): a guide whose commands stop being found fails here, not silently.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
limit=${FLEXPAR_GUIDE_TIMEOUT:-300}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/flexpar-guides.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
pc=$(find "$tmp/prefix" -name flexpar.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n "$pc" ]] || { echo "run_guide_commands: flexpar.pc was not installed" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
work="$tmp/work"
mkdir -p "$work"
ln -s "$build" "$work/build"
awk '/^```cpp$/ { inside = 1; next } /^```$/ { if (inside) exit } inside' "$src/doc/guide-collectives.md" > "$work/app.cpp"
[[ -s "$work/app.cpp" ]] || { echo "run_guide_commands: no C++ block in doc/guide-collectives.md" >&2; exit 1; }

# One command per line: inline code spans outside code blocks, and the lines of ```sh blocks
# (their trailing "# comment" dropped).
commands_of() {
  awk '
    /^```sh$/ { sh = 1; next }
    /^```/ { block = !block; sh = 0; next }
    sh { sub(/[ \t]+#.*$/, ""); if ($0 != "") print; next }
    block { next }
    {
      line = $0
      while (match(line, /`[^`]+`/)) {
        print substr(line, RSTART + 1, RLENGTH - 2)
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1" | grep -E '^([A-Z_]+=[^ ]+ )*(mpicxx\.mpich |mpiexec\.mpich -n [0-9]+ |build/)' || true
}

ran=0
for guide in "$src"/doc/guide-*.md; do
  name=${guide#"$src"/}
  mapfile -t commands < <(commands_of "$guide")
  if [[ ${#commands[@]} -eq 0 ]]; then
    # its commands may all stand in <!-- run --> blocks, which doc_commands.* runs with their output
    grep -q '^<!-- run' "$guide" && continue
    echo "run_guide_commands: FAILED: no command found in $name" >&2
    exit 1
  fi
  for command in "${commands[@]}"; do
    printf '\n==== %s: %s\n' "$name" "$command"
    # stdin from /dev/null: mpiexec forwards its stdin to rank 0
    if ! (cd "$work" && timeout "$limit" bash -c "$command" < /dev/null); then
      echo "run_guide_commands: FAILED ($name): $command" >&2
      exit 1
    fi
    ran=$((ran + 1))
  done
done
printf '\nrun_guide_commands: all %d commands of the guides ran as written\n' "$ran"
