"""Features computed outside etn: the file format (:mod:`.files`), planning a ``[features]``
pipeline (:mod:`.units`), importing files into split folders (:mod:`.importer`, ``etn
import``) and the classifier that last-layer heads start from (:mod:`.classifier`)."""
