"""The evaluation harness: does the debate beat a vote? (``conclave eval SET``, ``conclave eval report RUN``).

Items with known answers (:mod:`.items`) go through one ``mode=answer`` consultation each; every protocol —
one agent, the round-1 majority vote, the judge's synthesis of round 1, the full debate — is read from the same
consultation's rounds (:mod:`.protocols`), so nothing is paid twice. Scores (:mod:`.scoring`), statistics
(:mod:`.stats`) and the report (:mod:`.report`) come from the rows stored by :mod:`.store`.
"""
