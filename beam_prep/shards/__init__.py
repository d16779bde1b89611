"""How records reach their files: plan the shards, write them, commit them.

No pixel crosses a shuffle and no worker holds more than one image's records:

    pointers (image id, paths: a few hundred bytes each)
      -> split: the layout's, else a stable hash of the image id   (plan)
      -> PlanShards: groups per split = images x bytes per image / target,
         bytes per image measured in the job on a fixed sample of inputs
      -> group = stable hash of the image id % groups of its split
      -> GroupByKey(split, group): pointers only                   (write)
      -> WriteShards: per group, in a stable order, run the kernel on each
         input and stream each record into a file of this attempt's own
         temp folder; a file past twice the target is closed and the next
         one started
      -> commit_files (once, after every group): moves complete files into
         place as SPLIT-SSSSS-of-NNNNN, in (split, group, part) order (commit)

The bytes of every file depend only on the inputs and the config: not on the
runner, the worker count, bundle order or retries. Failed bundle attempts
leave files only in their own temp folder, which the commit deletes.
"""
