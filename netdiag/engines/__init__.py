"""Other ways to build the contract document than netdiag's own pipeline.

:mod:`netdiag.engines.tshark` builds it from tshark's dissection (``netdiag report
--engine tshark``); :mod:`netdiag.engines.verify` compares the two documents figure by
figure (``netdiag verify``).
"""
