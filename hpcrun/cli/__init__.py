"""The hpcrun command line: thin click commands (parse → call the library → render)."""
