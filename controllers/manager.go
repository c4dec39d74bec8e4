package controllers

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
)

// ControllerDefaults is the controller configuration of every manager that
// runs the operator's controllers: main's, and the tests' managers.
//
// The priority queue, controller-runtime's default, is off: in v0.24.1 it can
// deadlock on shutdown (kubernetes-sigs/controller-runtime#3538, fixed by
// #3540 after the release this module pins). A worker that took its last
// item as the queue shut down never hands it back, every other worker's Done
// waits on the lock the stuck send holds, and the manager never stops; a
// rolling update would wait out the whole graceful-shutdown timeout before
// the next leader can start. client-go's rate-limited workqueue has no such
// race, and nothing here needs priorities: the first list of a cold start is
// the only burst, and it is the whole work anyway.
func ControllerDefaults() config.Controller {
	return config.Controller{UsePriorityQueue: ptr.To(false)}
}
