package operator

import (
	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
)

// Warn logs at zap's warning level when the logger is zap underneath (the
// operator's is): logr has no warning level, and a warning at info level is
// lost among the routine lines. Elsewhere it logs at info.
func Warn(log logr.Logger, msg string, keysAndValues ...any) {
	if under, ok := log.GetSink().(zapr.Underlier); ok {
		fields := make([]zap.Field, 0, len(keysAndValues)/2)
		for i := 0; i+1 < len(keysAndValues); i += 2 {
			if k, ok := keysAndValues[i].(string); ok {
				fields = append(fields, zap.Any(k, keysAndValues[i+1]))
			}
		}
		under.GetUnderlying().WithOptions(zap.AddCallerSkip(1)).Warn(msg, fields...)
		return
	}
	log.Info("WARNING: "+msg, keysAndValues...)
}
