"""Run: start a rendered project on its nodes and supervise it to the end.

Takes a project folder (its answers.yaml) and gives a running job: an engine (run/engines/) launches the
ranks, job.py supervises them through the status stream, stops them on Ctrl-C or failure and writes the
run's summary; it hands the monitor (wizard.monitor) itself as a `RunningJob` (monitor/source.py) to show.
"""
