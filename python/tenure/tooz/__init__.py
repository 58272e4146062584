"""The Tooz driver by concern; ``tenure.tooz_driver`` re-exports its public names. Importing this
package imports none of its modules (:mod:`.names` and :mod:`.url` need no ``tooz``)."""
