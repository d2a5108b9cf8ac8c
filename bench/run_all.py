"""Runs every benchmark under bench/ (python3 -m tox -e bench, or directly)."""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py") and name != "run_all.py":
            print(f"\n## {name}\n", flush=True)
            sys.argv = [name]
            runpy.run_path(os.path.join(HERE, name), run_name="__main__")
