"""`python -m dnnscale`: the same program as the `dnnscale` script (dnnscale/entry.py)."""

from dnnscale.entry import main

if __name__ == "__main__":
    main()
