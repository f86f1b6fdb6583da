"""The tools' shared layer: what ``delaycomm.bench``, ``delaycomm.sim``, ``delaycomm.experiment`` and the telemetry
report each needed and used to write for themselves.

- :mod:`.table`: fixed-column text tables generated from one column schema (header, units row and cells).
- :mod:`.output`: JSON records written atomically (or to stdout), with numpy scalars and tuples converted.
- :mod:`.machine`: where a number was measured (host, CPU, cores, versions, the checkout's commit).
- :mod:`.args`: argparse types that name what they accept (numbers in a range, sizes, delay specs, output paths).
- :mod:`.units`: the size syntax (``4K``, ``64M``) and the formatting of sizes.
- :mod:`.launch`: ranks as fresh processes, each reporting to the parent, with a deadline and dead-rank detection.
- :mod:`.optional`: the optional imports (matplotlib, tqdm, scikit-learn), checked when a flag needs one, with a
  message that names the extra to install.

Internal: nothing here is part of the public API (``delaycomm.__all__``). Importing this package imports neither
torch nor the compiled module; the functions that need them import them when called.
"""
