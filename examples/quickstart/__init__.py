"""The quickstart project: a torchrun DDP script and the same script on hpcrun.

See docs/quickstart.md.
"""
