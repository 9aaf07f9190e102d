"""Keeping a data directory in order: the leftovers interrupted runs leave (:mod:`.leftovers`),
which ``etn verify`` lists and cleans and ``etn status`` reports."""
