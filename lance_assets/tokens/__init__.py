"""tokens"""
