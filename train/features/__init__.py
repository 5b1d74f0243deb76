"""Where a batch's target features come from: online, memory, offline shards or a streaming buffer.

sources.py  FeatureSource (what the loop calls) and the offline cache: data.features=online|memory|offline|stream
shards.py   the shard + manifest format, fingerprints, checksums, validation
extract.py  `draftsmith extract`: a run's features written once, resumable, sharded over ranks, disk-budgeted
stream.py   the producer thread that extracts ahead of the trainer into a bounded disk buffer
"""
