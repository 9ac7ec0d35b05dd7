"""Report: a run folder drawn as one self-contained page (report.html) and, on request, PNG files.

Takes what the run and the monitor left in a run folder (the ranks' event files, logs/, summary.json, run.json)
and gives `report.html` in that folder: loss, throughput per rank and per node, the compute-time spread with
the stragglers the monitor found, restarts, checkpoints and the failure with its root cause. It reads the
events streaming and keeps a bounded sample per rank (record.py), so thousands of ranks fit in seconds; the
plots are matplotlib's (plots.py), the page is plain HTML with the plots inlined (page.py).
"""
