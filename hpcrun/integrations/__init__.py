"""Bridges from other training frameworks to hpcrun's runtime (``main(ctx)``).

Each module imports its framework lazily-optional: importing ``hpcrun.integrations`` needs no
framework; importing ``hpcrun.integrations.lightning`` needs ``lightning``
(``pip install 'hpcrun[lightning]'``).
"""
