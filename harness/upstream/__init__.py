"""Upstream's own code as the judge: adapters that execute vLLM and vLLM Ascend in their own venv
(``make upstream``) and compare their answers with the harness's.

A room of its own: nothing on the harness's default path imports it, and :mod:`.worker` runs in
the upstream venv, not the harness's.
"""
