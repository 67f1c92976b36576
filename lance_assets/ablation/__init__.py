"""ablation"""
