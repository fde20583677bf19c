"""The Streamlit script that `syncopate dashboard` serves (`streamlit run app.py -- --db URL`).

Kept to one call so that the pages stay importable and testable: see :mod:`syncopate.dashboard.ui`.
"""

from syncopate.dashboard.ui import main

main()
