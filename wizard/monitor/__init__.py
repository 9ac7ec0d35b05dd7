"""Monitor: the views of a job and the status stream they read.

Takes the status events the ranks send (status_server.py) and a run folder or a `JobSource` handed in by
wizard.run, and gives the job's state (state.py), the live and plain views, and the run's report. It imports
nothing from wizard.run: the supervisor passes in what the views need.
"""
