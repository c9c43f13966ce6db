"""The one exception type for problems a user can fix.

Raise `UserError` with one line that names the problem and the fix; the
experiment binaries print it as ``error: <message>`` and exit with status 2,
without a traceback. This module imports nothing heavy, so the binaries can
catch it before TensorFlow is loaded.
"""


class UserError(Exception):
  """A problem the user can fix: bad input, missing file, unusable run directory."""
