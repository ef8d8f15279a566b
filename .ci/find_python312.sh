#!/usr/bin/env bash
# Print the path of a working Python 3.12 interpreter: PATH first, then pyenv installs.
ok() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }
for c in python3.12 python3; do
  p=$(command -v "$c" 2>/dev/null) && ok "$p" && { echo "$p"; exit 0; }
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for p in $(ls -d "$root"/versions/3.12.*/bin/python3 2>/dev/null | sort -V -r); do
  ok "$p" && { echo "$p"; exit 0; }
done
exit 1
