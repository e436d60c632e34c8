"""Quantize ddddocr 1.6.1's common_det.onnx (a third-party YOLOX detector from a PyPI wheel).

How the model was obtained (not committed; its licence is the wheel's):
    pip download ddddocr==1.6.1 --no-deps -d /tmp/dl
    cd /tmp/dl && unzip -o ddddocr-1.6.1-py3-none-any.whl 'ddddocr/*.onnx'
Then `python prepare.py` writes the fp32 model with a fixed input shape and four quantized
variants (QDQ/QOperator x U8S8/S8S8) to OUT; the benchmark ran the two U8S8 ones.
"""
import hashlib, sys
from pathlib import Path
import onnx
from tvm_ext import zoo
from tvm_ext.zoo_real import fix_input_shape
src = Path("/tmp/dl/ddddocr/common_det.onnx")
print("sha256", hashlib.sha256(src.read_bytes()).hexdigest())
out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")  # OUT
m = onnx.load(src)
m = fix_input_shape(m, "images", (1, 3, 416, 416))
fp = out / "dddd_det_fp32.onnx"
onnx.save(m, fp)
for fmt in ("qdq", "qoperator"):
    for act in ("uint8", "int8"):
        name = f"dddd_det_int8_{fmt}" + ("_s8s8" if act == "int8" else "")
        p = zoo.quantize_onnx(fp, out / f"{name}.onnx", fmt, activation_type=act, preprocess=True)
        print("wrote", p)
