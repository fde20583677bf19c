"""results_db"""
