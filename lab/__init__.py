"""The lab: experiments that train many runs (ablate, extend, recipe), run as `python -m lab.ablate CONFIG.toml`.

grid.py (runs and their folders), launch.py and pool.py (where runs train), sweep.py (the frame of a tool that
sweeps rates and tests seeds), evaluation.py, stats.py and report.py are what the tools share; no tool imports
another tool.
"""
