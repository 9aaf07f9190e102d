"""From a pipeline file to a plan: the pipeline, its overrides, its units and their keys. Pure:
it reads files and computes keys, and builds, trains and loads nothing."""
