"""The debate-quality layer: labelled claims and their citations, the debate state with stable claim and evidence
ids, verification questions, perspective anchors, and the figures that measure them.

Everything here is deterministic code over artifacts; :mod:`conclave.engine.quality` wires it into a consultation.
"""
