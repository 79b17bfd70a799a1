"""Read what the training does: hooks on the hot path, state read at scrape time.

Each module here measures one thing and knows nothing of how it is exported: the recorder
(steps, phases, collectives), the comm hook and the DataLoader/optimizer instrumentors that
feed it, the in-flight state (Flight Recorder or comm-hook bookkeeping), the store heartbeat,
memory, versions, named sections and the job's wall clock.
"""
