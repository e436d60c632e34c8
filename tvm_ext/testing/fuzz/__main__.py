"""``python -m tvm_ext.testing.fuzz``: :func:`tvm_ext.testing.fuzz.runner.main`."""
import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
