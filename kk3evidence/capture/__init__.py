"""The side-effecting edge: run the served program, record it, probe it over HTTP.

``run`` is the capture itself; ``pump`` moves output to the terminal and the staging folder;
``procscan`` reads ``/proc``; ``fingerprint`` collects host, GPU, container and Python facts;
``http`` talks to the served API; ``ladder`` runs a plan one bundle per step.
"""
