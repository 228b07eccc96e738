"""Reports: tables for the terminal, JSON for scripts, plots."""
