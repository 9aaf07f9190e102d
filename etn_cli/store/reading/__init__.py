"""Reading a split: every read checks the folder against its manifest (:mod:`.reader`), and a
pipeline's splits are checked against each other before a stage uses them
(:mod:`.consistency`)."""
