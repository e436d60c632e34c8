"""The parts of ``benchmarks/compare_commits.py``: a commit's code imported from its worktree
(``tree``), one model built and run at one commit (``child``), and two commits' results compared
(``diff``). Imports nothing of tvm-ext: the child imports the commit's own."""
