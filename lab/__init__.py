"""The lab: experiments that train many runs (ablate, extend, recipe), run as `python lab/ablate.py CONFIG.toml`.

grid.py, stats.py and report.py are what the tools share; no tool imports another tool.
"""
