import json, sys, collections
g = json.load(open(sys.argv[1]))
nodes = g["nodes"]; dt = g["attrs"]["dltype"][1]; sh = g["attrs"]["shape"][1]
rowptr = g["node_row_ptr"]
want = sys.argv[2] if len(sys.argv) > 2 else "int32"
readers = collections.defaultdict(list)
for i, n in enumerate(nodes):
    for (src, idx, _) in n.get("inputs", []):
        readers[(src, idx)].append(n["name"])
for i, n in enumerate(nodes):
    if n["op"] == "null": continue
    nout = rowptr[i+1] - rowptr[i]
    for k in range(nout):
        e = rowptr[i] + k
        if dt[e] == want and readers.get((i, k)):
            print(n["name"], sh[e], dt[e], "->", readers[(i, k)])
