"""Calibrated kernel and collective cost forms: parameters, formulas, fitting and checking.

``params`` holds the fitted parameters of one GPU (read from its TOML file), ``forms`` the
physical formulas (roofline times shape-dependent efficiency plus fixed latencies), ``fit``
fits the parameters to measured CSVs, and ``check`` predicts such CSVs and reports errors.
See docs/cost-model.md.
"""
