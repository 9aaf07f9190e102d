"""Artefacts besides feature splits: the backbone's final layer (:mod:`.classifier`), the
files of a trained head (:mod:`.headfiles`) and the per-row predictions beside each metrics
file (:mod:`.predictions`)."""
