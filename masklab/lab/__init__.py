"""The lab: studies, their runner and reports, training, labels and evaluation of the routers.

Nothing in the product (:mod:`masklab.context`, :mod:`masklab.integrations`) imports it
(``tests/test_layers.py``).
"""
