"""Benchmarks for ingest: conversion speed, pipeline throughput, accelerator idle time."""
