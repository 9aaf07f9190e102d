"""Writing a split: how ``etn extract`` (or your own code) turns batches into a split folder.

In the order a split is written: :mod:`.checks` checks each batch at the boundary;
:mod:`.writer`'s ``ShardWriter`` buffers the rows and cuts them into shards, which
:mod:`.shardfile` writes byte-identically for the same arrays; :mod:`.journal` records each
finished shard so that a killed run resumes there; :mod:`.manifest` is written last, and the
private folder is then renamed into place (:mod:`etn_cli.store.atomic`). Under torchrun each rank
writes pieces of the split instead (:mod:`.pieces`), which rank 0 merges into the same folder
(:mod:`.merge`).
"""
