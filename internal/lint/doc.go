// Package lint holds checks of the repository's source that run as tests:
// rules of the project's developer guide that gofmt and go vet do not
// enforce. It has no API.
package lint
